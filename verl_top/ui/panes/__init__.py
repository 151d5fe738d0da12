"""One module per pane of the five-step method; each pane is a ``Pane`` with ``refresh_pane``."""

from verl_top.ui.panes.base import Pane
from verl_top.ui.panes.communication import CommunicationPane
from verl_top.ui.panes.config import ConfigPane
from verl_top.ui.panes.dataflow import DataflowPane
from verl_top.ui.panes.mapping import MappingPane
from verl_top.ui.panes.throughput import ThroughputPane

PANE_CLASSES: tuple[type[Pane], ...] = (
    ThroughputPane,
    CommunicationPane,
    DataflowPane,
    MappingPane,
    ConfigPane,
)

__all__ = [
    "PANE_CLASSES",
    "CommunicationPane",
    "ConfigPane",
    "DataflowPane",
    "MappingPane",
    "Pane",
    "ThroughputPane",
]
