"""Files a training stage makes per model for one decoding method to read (Kangaroo's adapter, MindSkip's routers).

Evaluate gives a method the model's own file through the option named here, checked to be trained on the same
weights; configure checks that ``<section>.models`` covers every model such a method runs on.
"""

from __future__ import annotations

from dataclasses import dataclass

from exitbench.models.adapter import ADAPTER_FILE
from exitbench.models.router import ROUTER_FILE


@dataclass(frozen=True)
class TrainedFile:
    """A file a training stage makes per model, which evaluate gives the methods with its option:
    ``<models>/<folder>/<model>/<file>``, listed in ``<section>.models``."""

    folder: str
    file: str
    stage: str
    section: str
    what: str


#: the trained add-ons a method may read, by option name
TRAINED_FILES = {
    "adapter_file": TrainedFile("adapters", ADAPTER_FILE, "train_adapters", "adapters", "Kangaroo adapter"),
    "router_file": TrainedFile("routers", ROUTER_FILE, "train_routers", "routers", "set of routers"),
}
