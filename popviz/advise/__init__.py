"""advise: the advisor, which re-plans a recorded program (other splits, AMP per IPU,
recomputation, schedule) with the compiler and ranks the layouts. It sits beside cli, above
analysis: it opens profiles and compiles, which analysis (pure functions) never does."""
