"""The largest sizes perfcast takes from a user (flags, ``--set``/``--sweep``): past them no
serving engine runs the step, and the counts would overflow the integers torch and the kernels
count in. Each limit says where it comes from (docs/design/cli.md)."""

#: Tokens in one sequence (new and cached) and in one step (all sequences' new tokens):
#: attention kernels index a batch's tokens with 32-bit integers (FlashAttention's ``cu_seqlens``
#: and vLLM's ``query_start_loc`` are int32), so no engine runs more than 2³¹ − 1 of them.
MAX_TOKENS = 2**31 - 1
#: Sequences in one batch: 2²⁴, four orders of magnitude above the largest batch an engine
#: schedules (vLLM's ``max_num_seqs`` defaults to 256–1024).
MAX_SEQUENCES = 2**24
#: Devices, and each parallel size: 2²⁰, about a thousand times the largest deployments.
MAX_DEVICES = 2**20
#: An image side in pixels: 65,535, the largest a JPEG states (ITU-T T.81: 16-bit height and width).
MAX_PIXELS = 65_535
#: Images per sequence: 2¹⁶ (each image is at least one token, so the step's token limit binds first).
MAX_IMAGES = 2**16
#: A DSL size symbol (a kernel's extent): indexed with 32-bit integers, as MAX_TOKENS.
MAX_SIZE = 2**31 - 1
#: A message or a buffer in bytes: what a 64-bit address space holds.
MAX_BYTES = 2**64
#: The elements of one tensor: torch counts them in int64.
MAX_ELEMENTS = 2**63 - 1
