"""The evaluation suite: one scorer per task kind (tasks), the metrics against their reference
definitions (metrics), embedding and scoring one system and the tables (suite), plots, and the
mteb adapter (mteb). The datasets themselves are sources: :mod:`modsent.sources.evaluation`."""
