"""Reports: views of a roll-up for people (terminal) and programs (JSON)."""
