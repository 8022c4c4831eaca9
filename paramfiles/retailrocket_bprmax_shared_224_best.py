"""Published best GRU4Rec hyperparameters for retailrocket (docs/behaviour.md §7): bpr-max, shared embedding, 224 units.

Read by gru4rec.config without being executed; the same values are in retailrocket_bprmax_shared_224_best.json."""
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'bpr-max'),
    ('final_act', 'elu-0.5'),
    ('constrained_embedding', True),
    ('embedding', 0),
    ('layers', [224]),
    ('n_epochs', 10),
    ('batch_size', 80),
    ('dropout_p_embed', 0.5),
    ('dropout_p_hidden', 0.05),
    ('learning_rate', 0.05),
    ('momentum', 0.4),
    ('n_sample', 2048),
    ('sample_alpha', 0.4),
    ('bpreg', 1.95),
    ('logq', 0.0),
    ('adapt', 'adagrad'),
])
