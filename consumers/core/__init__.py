"""The CN core: applies logtail records and answers snapshot reads, in plain Python."""
