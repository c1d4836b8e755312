"""What an operator sees of a stream: the target table as it is now, the run's figures, its status."""
