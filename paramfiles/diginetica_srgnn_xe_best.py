"""GRU4Rec on the SR-GNN-protocol DIGINETICA (docs/results.md): cross-entropy, shared embedding, 128 units.

Chosen by an Optuna study (gru4rec paropt, paramspaces/gru4rec_xe_shared_parspace.json,
objective MRR@20 on train_valid after training on train_tr, conservative ties, trials of 4
epochs): trial 4, the best of 6 finished trials (12 started, 2026-12-03), validation MRR@20
0.1766 (epochs 1-4: 0.1529, 0.1675, 0.1738, 0.1766; the enqueued published-shaped configuration
with 512 units: 0.1760 in three times the time). n_epochs is the published 10: trained that
long, validation MRR@20 reaches 0.1805, still rising slowly.
Study: results/diginetica_srgnn_xe.trials.json.

Read by gru4rec.config without being executed."""
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'cross-entropy'),
    ('final_act', 'softmax'),
    ('constrained_embedding', True),
    ('embedding', 0),
    ('layers', [128]),
    ('n_epochs', 10),
    ('batch_size', 64),
    ('dropout_p_embed', 0.25),
    ('dropout_p_hidden', 0.3),
    ('learning_rate', 0.08),
    ('momentum', 0.25),
    ('n_sample', 2048),
    ('sample_alpha', 0.6),
    ('logq', 1.0),
    ('adapt', 'adagrad'),
])
