"""What predicts: from the compiler's figures to a step time and MFU, the collectives' cost, the
error band, and the HBM estimate before any compile."""
