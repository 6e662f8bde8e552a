"""What runs inside the sandbox: the runner package, stdlib only, shipped as source and byte-code in every sandbox
image. The operator imports its `protocol` module, so both sides of the frame are spelt in one place."""
