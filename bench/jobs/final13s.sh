# final13.sh cut to the device time session 13 had left (344 s; it ran at 19:32 with TOTAL=270): the attention tests,
# v4's walks timed, then bench/jobs/k27b.sh part 4 (8k and 32k streamed; the 32k CPU-expert step when time is left).
# (The fixture check final13.sh runs since was added after that call.)
# Run: carry [".device/f13"], `TOTAL=270 OUT=$OUT bash .device/f13/scripts/device run final13s:280`.
F13_SHORT=1 exec bash "$(dirname "${BASH_SOURCE[0]}")/final13.sh"
