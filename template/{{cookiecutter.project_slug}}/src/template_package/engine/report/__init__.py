"""Reporting: predictions, a confusion matrix, the progress bar, throughput, loggers that resume, peak FLOP/s."""
