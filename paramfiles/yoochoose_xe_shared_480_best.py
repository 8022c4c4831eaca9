"""Published best GRU4Rec hyperparameters for yoochoose (docs/behaviour.md §7): cross-entropy, shared embedding, 480 units.

Read by gru4rec.config without being executed; the same values are in yoochoose_xe_shared_480_best.json."""
from collections import OrderedDict

gru4rec_params = OrderedDict([
    ('loss', 'cross-entropy'),
    ('final_act', 'softmax'),
    ('constrained_embedding', True),
    ('embedding', 0),
    ('layers', [480]),
    ('n_epochs', 10),
    ('batch_size', 48),
    ('dropout_p_embed', 0.0),
    ('dropout_p_hidden', 0.2),
    ('learning_rate', 0.07),
    ('momentum', 0.0),
    ('n_sample', 2048),
    ('sample_alpha', 0.2),
    ('bpreg', 0.0),
    ('logq', 1.0),
    ('adapt', 'adagrad'),
])
