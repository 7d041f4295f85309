"""What encodes sentences: the base models (base_models), the modular encoder that stacks one
language's modules on a base (modular), and every evaluated system by name (systems)."""
