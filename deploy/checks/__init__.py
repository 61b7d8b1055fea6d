"""Validation of deploy/: run through deploy/check.sh (python -m checks)."""
