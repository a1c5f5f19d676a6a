"""The tolerance policy: every allowance a check is judged by, the measured data it derives from, the
exact bounds and the ill-posedness rules."""
