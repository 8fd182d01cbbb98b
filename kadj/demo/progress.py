"""The demo's progress bar (tqdm): one tick per optimiser iteration, with the loss and
the relative error of the current field."""


class Progress:
    def __init__(self, total, enabled=True):
        from tqdm import tqdm
        self.bar = tqdm(total=total, desc="L-BFGS", unit="it", disable=not enabled,
                        dynamic_ncols=True, leave=True)

    def update(self, loss, error):
        self.bar.set_postfix_str(f"loss {loss:.4e}, field error {error:.3f}", refresh=False)
        self.bar.update(1)

    def close(self):
        self.bar.close()
