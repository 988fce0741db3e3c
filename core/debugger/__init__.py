"""The episode debugger (issue 27): breakpoints on model calls, a control socket, interventions."""
