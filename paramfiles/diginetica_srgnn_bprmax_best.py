"""GRU4Rec on the SR-GNN-protocol DIGINETICA (docs/results.md): bpr-max, shared embedding, 512 units.

Chosen by an Optuna study (gru4rec paropt, paramspaces/gru4rec_bprmax_shared_parspace.json,
objective MRR@20 on train_valid after training on train_tr, conservative ties, trials of 4
epochs): the best of 5 finished trials (12 started, 2026-12-03) is the enqueued published
diginetica configuration, validation MRR@20 0.1802 (epochs 1-4: 0.1542, 0.1704, 0.1768,
0.1802), still rising at epoch 4; n_epochs is the published 10: trained that long, validation
MRR@20 levels off after epoch 7 (0.1821; epoch 10: 0.1820).
Study: results/diginetica_srgnn_bprmax.trials.json.

Read by gru4rec.config without being executed."""
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'bpr-max'),
    ('final_act', 'elu-1'),
    ('constrained_embedding', True),
    ('embedding', 0),
    ('layers', [512]),
    ('n_epochs', 10),
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
