"""``opencode-tui report``: a run, or a batch's runs, as one self-contained HTML file."""
