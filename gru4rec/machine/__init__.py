"""The machine a process runs on: its CPUs (``cpus``), torch's threads (``threads``), the device a
model uses (``devices``) and the memory the process has used (``resources``)."""
