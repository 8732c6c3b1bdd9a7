"""odradek's extensions to the Kafka protocol: what odradek serves that Apache Kafka does not
(docs/extensions.md). Each is off unless a broker setting enables it, and then only clients that ask
for it see it.

Numbering: API keys and tagged-field tags from 16384 (2**14) up. Kafka's API keys end in the low
hundreds and its tags in the low tens, so neither can collide with a key or tag Kafka assigns.

- ConsumerGroupPrepareAssignment (16384) and ConsumerGroupInstallAssignment (16385): seed 002's
  client-side assignors (KIP-848's draft; Kafka's message files named them with apiKey -1 and the
  APIs never shipped). Served, and listed by ApiVersions, only with
  `group.consumer.client.assignors.enable=true`; otherwise a request is answered UNSUPPORTED_VERSION.
- ConsumerGroupHeartbeat tags: request 16384 ClientAssignors; response 16384 ShouldComputeAssignment,
  Assignment 16384-16385 the assignor's metadata for the member.
- __consumer_offsets tags: ConsumerGroupMemberMetadataValue 16384 (the member's client assignors),
  ConsumerGroupTargetAssignmentMemberValue 16384-16385 (the assignor's metadata for the member).
"""

CONSUMER_GROUP_PREPARE_ASSIGNMENT = 16384
CONSUMER_GROUP_INSTALL_ASSIGNMENT = 16385
CLIENT_ASSIGNOR_APIS = frozenset({CONSUMER_GROUP_PREPARE_ASSIGNMENT, CONSUMER_GROUP_INSTALL_ASSIGNMENT})
EXTENSION_APIS = CLIENT_ASSIGNOR_APIS
