"""Defences at the door, decided on a call's metadata before its body is read: the front door (``door``),
bearer tokens and the guessers' throttle (``auth``), probes paid for before their body is read
(``probes``), per-call limits and lanes (``limits``), leases on what a call waits for from its client
(``watchdog``), a log a flood cannot fill (``ratelog``), and what a configuration exposes (``security``).
Connection policy is the edge proxy's (``deploy/proxy/``)."""
