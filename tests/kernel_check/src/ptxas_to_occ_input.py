"""Turn `ptxas -v` output (and launch bounds from cuobjdump) into occ_oracle input lines."""

import re
import sys
from pathlib import Path

ptxas, cuobj = Path(sys.argv[1]).read_text(), Path(sys.argv[2]).read_text()
bounds: dict[str, int] = {}
for section in re.split(r"^\.nv\.info\.", cuobj, flags=re.M)[1:]:
    name = section.split()[0]
    m = re.search(
        r"EIATTR_MAX_THREADS\s+Format:\s+\S+\s+Value:\s+(0x[0-9a-f]+) (0x[0-9a-f]+) (0x[0-9a-f]+)", section
    )
    if m:
        bounds[name] = int(m[1], 16) * int(m[2], 16) * int(m[3], 16)
for m in re.finditer(
    r"Compiling entry function '([^']+)' for '(sm_\d+)'.*?Used (\d+) registers, used (\d+) barriers([^\n]*)",
    ptxas,
    flags=re.S,
):
    name, arch, regs, barriers, rest = m[1], m[2], int(m[3]), int(m[4]), m[5]
    smem = re.search(r"(\d+) bytes smem", rest)
    print(arch, name, regs, int(smem[1]) if smem else 0, bounds.get(name, 0), barriers)
