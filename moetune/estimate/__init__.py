"""An analytic step-time model of a Megatron MoE layout on a cluster (`moetune predict`, and
`moetune plan`'s ranking): step.py assembles the terms, flops.py prices compute, comm.py the
links, rates.py holds every rate with its source; readings.py reads the store (calibrations,
fits), pricing.py is the one entry (`price`) every caller prices a layout through."""
from moetune.estimate.pricing import price
from moetune.estimate.rates import PUBLISHED, Rate, Rates
from moetune.estimate.readings import StoreReadings
from moetune.estimate.step import (
    Node,
    Prediction,
    bubble_fraction,
    micro_batches,
    predict,
)

__all__ = ["PUBLISHED", "Node", "Prediction", "Rate", "Rates", "StoreReadings", "bubble_fraction",
           "micro_batches", "predict", "price"]
