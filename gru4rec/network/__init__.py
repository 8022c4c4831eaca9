"""The GRU4Rec network: item tables, the GRU cell in the Cho form, scoring (``gru``)."""
