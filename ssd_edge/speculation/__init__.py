"""Proposing tokens for the target to verify: drafters (the draft model, the n-gram lookup),
prespec (SSD: outcomes, the speculation cache, the draft worker), policy (when to pre-speculate)."""
