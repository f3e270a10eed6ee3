from llmrl.fingerprint import environment_fingerprint, fingerprint_line


def test_fingerprint_names_cpu_isa_threads_and_versions():
    import torch

    fp = environment_fingerprint()
    assert fp["isa"] == torch.backends.cpu.get_cpu_capability()
    assert fp["threads"] == torch.get_num_threads()
    assert fp["libraries"]["torch"].startswith("2.13")
    line = fingerprint_line()
    assert fp["cpu"] in line and fp["isa"] in line and "torch 2.13" in line
