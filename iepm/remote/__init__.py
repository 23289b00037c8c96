"""Target hosts: the ``iepm agent`` responder (agent.py, client.py), agentless SSH (ssh.py),
and who may test whom (trust.py)."""
