"""The protocol layer: the client requests' vocabulary and framing, the reply codec, the change-log
records, the ipc frames between a node's processes, request origins, node roles and the limits a
client reads. It imports nothing else of the project; every other package builds on it."""
