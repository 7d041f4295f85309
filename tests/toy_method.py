"""A training method in a few lines, registered once (tests/test_workflow.py runs it): every
weight of the base model trained with a new objective over the existing paraphrase pairs."""

from modsent import losses, methods
from modsent.methods import baselines


class AnchorPositiveCosine(losses.CosineSimilarityLoss):
    """Pulls each anchor towards its positive (cosine 1); hard negatives are not used."""

    def forward(self, anchors, positives, negatives=None):
        return super().forward(anchors, positives)


methods.register(baselines.full_parameter_method(
    "Toy-cos", "every weight, cosine loss on the paraphrase pairs (the tests' toy method)",
    objective=lambda settings: AnchorPositiveCosine()))
