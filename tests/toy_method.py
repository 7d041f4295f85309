"""A training method in a few lines, registered once (tests/test_workflow.py runs it): every
weight of the base model trained with a new objective over the existing paraphrase pairs.

The workflow imports this module whenever it plans (every snakemake start, and every job of a
cluster run), so it imports nothing heavy: the loss, and torch with it, load when it trains."""

from modsent import methods
from modsent.methods.full import full_parameter_method


def anchor_positive_cosine(settings):
    """Pulls each anchor towards its positive (cosine 1); hard negatives are not used."""
    from modsent import losses

    class AnchorPositiveCosine(losses.CosineSimilarityLoss):
        def forward(self, anchors, positives, negatives=None):
            return super().forward(anchors, positives)

    return AnchorPositiveCosine()


methods.register(full_parameter_method(
    "Toy-cos", "every weight, cosine loss on the paraphrase pairs (the tests' toy method)",
    objective=anchor_positive_cosine))
