"""The opencode-tui agent server, as Gym starts a server: this directory's ``app.py`` (see
opencode_tui_core/gym/agent.py)."""

from nemo_gym.server_utils import is_nemo_gym_fastapi_entrypoint

from opencode_tui_core.gym.agent import OpenCodeTuiAgent

if __name__ == "__main__":
    OpenCodeTuiAgent.run_webserver()
elif is_nemo_gym_fastapi_entrypoint(__file__):
    # Gym's multi-worker path imports this module in each uvicorn worker for its `app`.
    app = OpenCodeTuiAgent.run_webserver()
