"""Gang scheduling over queues with the spot plugin: a pure decision core (snapshot in, decisions out)."""
