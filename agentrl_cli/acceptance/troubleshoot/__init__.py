"""Symptom knowledge base (`knowledge_base.yaml`, data) and its fuzzy lookup (`knowledge.py`).
Diagnosis of a recorded run (`agentrl troubleshoot --run`) will live beside them."""
