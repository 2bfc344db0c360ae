"""What a request carries: its envelope (:mod:`.types`), the datatypes (:mod:`.datatypes`) and
tensors' raw byte layout (:mod:`.rawtensor`)."""
