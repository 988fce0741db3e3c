"""NeMo Gym: rollouts as episodes (``rollout``, no Gym import) and the agent server (``agent``, the
``gym`` extra). See docs/gym.md."""

from pathlib import Path

# A Gym component root (``NEMO_GYM_EXTRA_ROOTS``): it holds responses_api_agents/opencode_tui_agent.
GYM_ROOT = Path(__file__).resolve().parent / "root"
AGENT_SERVER_DIR = GYM_ROOT / "responses_api_agents" / "opencode_tui_agent"
AGENT_CONFIG = AGENT_SERVER_DIR / "configs" / "opencode_tui_agent.yaml"
