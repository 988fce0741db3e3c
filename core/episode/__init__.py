"""One episode, as phases: each phase a module with a function that returns a typed result
(seed, install, agent, close, transcript, verify, release; record writes what is left behind), and
``Episode`` (episode.py), the thin orchestrator that holds the events, the cancel and keep state and
the close deadline. The outcome is ``opencode_tui_core.outcome.decide_outcome``, a pure function of the facts.
"""

from opencode_tui_core.episode.common import StageFailure
from opencode_tui_core.episode.episode import Episode
from opencode_tui_core.episode.lineage import LineageError, Parent, child_inputs, fork_point, load_parent
from opencode_tui_core.episode.record import EpisodeResult, new_run_id

__all__ = [
    "Episode",
    "EpisodeResult",
    "LineageError",
    "Parent",
    "StageFailure",
    "child_inputs",
    "fork_point",
    "load_parent",
    "new_run_id",
]
