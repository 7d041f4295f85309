"""The modular encoder's training stages, one module each, in the order the workflow runs them:
tokenizer_training (a tokenizer per language), fasttext_embeddings and focus (the new
vocabulary's embeddings), language_adapter (LoRA + MLM), sentence_adapter (LoRA + MNRL),
alignment (the cross-lingual adapters and their merge) and parallel_adapter (the adapter kind
the language adapter can use instead of LoRA). :mod:`modsent.encoders.modular` puts them together."""
