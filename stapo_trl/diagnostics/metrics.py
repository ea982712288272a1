"""Names of the mechanism metrics (the paper's Table 1), shared by the trainer's logging and the readers of the logs.

Plain names, no torch: the report command reads logs without loading it.
"""

# Table 1's quadrants of the positive-advantage loss tokens: probability below / above τ_p × entropy below / above
# τ_h, in this order; then the tokens S2T silenced.
QUADRANTS = ("low_prob_low_entropy", "low_prob_high_entropy", "high_prob_low_entropy", "high_prob_high_entropy")
GROUPS = (*QUADRANTS, "silenced")
# Per group: share of the tokens, share of their summed logit-gradient norm, mean first-order entropy change.
COLUMNS = ("token_share", "grad_norm_share", "entropy_change")
MECHANISM_PREFIX = "mechanism/"
