"""The evaluation suite: datasets (data), metrics against their reference definitions (metrics),
embedding and scoring one system (suite), plots, and the mteb adapter (mteb)."""
