"""The opensandbox sandbox provider."""
