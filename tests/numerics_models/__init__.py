"""Training steps whose outputs amplify rounding (quantisers, Adam on zero gradients, 16-bit
floats): verify's numerics check must pass correct plans of them and catch wrong ones.
Each module's builders return ``(step, args)``, as a MODEL spec's attr does
(``partex verify tests/numerics_models/quant.py:int8 plan.json --run``)."""
