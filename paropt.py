#!/usr/bin/env python
"""Tune GRU4Rec hyperparameters with Optuna; the original's ``paropt.py`` command line.

    python paropt.py TRAIN VALID -opf paramspaces/gru4rec_xe_shared_parspace.json \\
        -fp "loss=cross-entropy,constrained_embedding=True,logq=1.0,n_sample=2048,n_epochs=10" \\
        -nt 200 -m 20 -pm mrr --final-test TEST

Same as ``gru4rec paropt``; ``python paropt.py --help`` explains every option.
"""
import sys

from gru4rec.cli.paropt import main

if __name__ == "__main__":
    sys.exit(main())
