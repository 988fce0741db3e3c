"""Run directories in other people's formats: ATIF trajectories and OpenAI-style chat messages."""
