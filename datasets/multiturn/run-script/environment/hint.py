print('Now run this command:')
print()
print('echo', 22 * 31, '> answer.txt')
