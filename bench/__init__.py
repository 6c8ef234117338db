"""Side-by-side benchmarks: each compares two things in one run and reports ratios."""
