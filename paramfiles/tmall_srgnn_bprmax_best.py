"""GRU4Rec on the SR-GNN-protocol Tmall (docs/results.md): bpr-max, shared embedding, 512 units.

Chosen by an Optuna study (gru4rec paropt, paramspaces/gru4rec_bprmax_shared_parspace.json,
objective MRR@20 on train_valid after training on train_tr, conservative ties, trials of 5
epochs): trial 0, the best of 2 finished trials (3 started, 2026-12-03), the enqueued published
diginetica configuration. Its validation MRR@20 by epoch: 0.1603, 0.1874, 0.1908, 0.1883, 0.1858,
so n_epochs is 3 (validation MRR@20 0.1908). The test set is held back (measured outside the
project). Study: results/tmall_srgnn_bprmax.trials.json.

Read by gru4rec.config without being executed."""
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'bpr-max'),
    ('final_act', 'elu-1'),
    ('constrained_embedding', True),
    ('embedding', 0),
    ('layers', [512]),
    ('n_epochs', 3),
    ('batch_size', 128),
    ('dropout_p_embed', 0.5),
    ('dropout_p_hidden', 0.3),
    ('learning_rate', 0.05),
    ('momentum', 0.15),
    ('n_sample', 2048),
    ('sample_alpha', 0.3),
    ('bpreg', 0.9),
    ('logq', 0.0),
    ('adapt', 'adagrad'),
])
