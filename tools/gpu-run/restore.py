"""An fp16 safetensors file (``<path>.fp16``) back to fp32 at ``<path>`` (the weights travelled in half precision)."""
import os, sys
from safetensors.torch import load_file, save_file
for p in sys.argv[1:]:
    save_file({k: v.float() if v.is_floating_point() else v for k, v in load_file(p + ".fp16").items()}, p)
    os.remove(p + ".fp16")
    print("restored", p)
