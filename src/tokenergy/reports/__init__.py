"""Reports made from run folders, never from training code: curves and tables of runs and
ablations (:mod:`.runs`), LM runs' per-token pictures, diagnostics and ablation tables
(:mod:`.lm`), and the pipeline's size × domain grids (:mod:`.pipeline`)."""
