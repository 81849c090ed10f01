"""What spans machines: Slurm's nodes on a circuit (slurm.py drives Slurm's own commands,
circuits.py decides when), and the other nodes of a multi-node job (peers.py)."""
