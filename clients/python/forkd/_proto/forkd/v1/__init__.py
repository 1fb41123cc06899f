"""Generated from proto/ by scripts/generate.sh: do not edit."""
