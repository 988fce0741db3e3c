"""The docker sandbox provider."""
