"""The credit stage: per-token energies and the weights, shaped rewards and prior that carry
them into the loss (:mod:`.token_credit`, from the math of :mod:`tokenergy.energy`), learned
energy models (:mod:`.energy_models`), and the diagnostics that say where credit goes
(:mod:`.diagnostics`)."""
