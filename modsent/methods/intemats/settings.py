"""The names and allowed values of InteMATs' systems and settings, shared by the registration
(:mod:`modsent.methods.intemats`) and the training (:mod:`modsent.methods.intemats.training`).
Imports nothing heavy."""

ST, DT, FUSED = "InteMATs-ST", "InteMATs-DT", "InteMATs"
SITES = ["attention", "ffn"]  # modsent.modular.serial_adapter.SITES
FUSION_PAIRS = ("crosslingual", "monolingual")
