"""What plans: `tpu-tune plan`'s entry (`plan.plan`), its options and problem, the joint space and
its Optuna search, memory first, the result, rankings and prices."""
