"""Experience: prompt groups, scored sequences, advantages and the micro-batch losses.

Import from the modules (`experience.types`, `experience.advantages`, ...): this package
file loads nothing, so the scheduler and forecast can read `experience.types` without torch."""
