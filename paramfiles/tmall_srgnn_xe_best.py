"""GRU4Rec on the SR-GNN-protocol Tmall (docs/results.md): cross-entropy, shared embedding, 512 units.

Chosen by an Optuna study (gru4rec paropt, paramspaces/gru4rec_xe_shared_parspace.json,
objective MRR@20 on train_valid after training on train_tr, conservative ties, trials of 5
epochs): trial 0, the only finished trial of 2 started (2026-12-03), the enqueued published
diginetica values with the cross-entropy loss. Its validation MRR@20 by epoch: 0.1397, 0.1717,
0.1837, 0.1859, 0.1837, so n_epochs is 4 (validation MRR@20 0.1859). The test set is held back
(measured outside the project). Study: results/tmall_srgnn_xe.trials.json.

Read by gru4rec.config without being executed."""
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'cross-entropy'),
    ('final_act', 'softmax'),
    ('constrained_embedding', True),
    ('embedding', 0),
    ('layers', [512]),
    ('n_epochs', 4),
    ('batch_size', 128),
    ('dropout_p_embed', 0.5),
    ('dropout_p_hidden', 0.3),
    ('learning_rate', 0.05),
    ('momentum', 0.15),
    ('n_sample', 2048),
    ('sample_alpha', 0.3),
    ('logq', 1.0),
    ('adapt', 'adagrad'),
])
