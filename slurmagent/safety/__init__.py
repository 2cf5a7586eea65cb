"""Safety and control around the action gate (slurmagent/safety/gate.py): the policy, the kill
switch, approvals, the audit tools and the replay sandbox."""
